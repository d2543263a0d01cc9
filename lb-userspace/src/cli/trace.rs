//! `lbctl trace`: what the packet path (tc ingress or XDP on an external
//! device) does now with a packet of a given tuple arriving from outside,
//! worked out from the pinned maps alone, step by step in the programs'
//! order (lb-ebpf `packet::ingress_of`, `known_flow`, `new_flow::pick`):
//! the frontend (its node-local view for externalTrafficPolicy: Local), a
//! live conntrack entry, the source-range check, "no backend", the
//! sessionAffinity entry, then the Maglev slot or the random choice.
//!
//! It reads and never writes: a traced tuple changes no conntrack, affinity
//! or counter. What it cannot know it says: a random choice names every
//! backend it could be, and a packet to a port of the SNAT range may be a
//! reply to a SNAT flow, looked up first by the programs.
use std::net::{IpAddr, SocketAddr};

use anyhow::Context as _;
use aya::{
    maps::{lpm_trie::Key as LpmKey, Array, HashMap, HashOfMaps, LpmTrie, MapData},
    Pod,
};
use lb_common::{
    affinity::{address_client4, address_client6, AffinityKey, AffinityMatchKey, AffinityValue},
    backend::{Backend4, Backend6, BACKEND_FLAG_LOCAL},
    config::{
        CFG_FRONTEND_FILTER, CFG_LB_MODE, CFG_MAGLEV_M, CFG_SNAT_PORTS_EVER, CFG_SNAT_PORT_MAX,
        CFG_SNAT_PORT_MIN,
    },
    conntrack::{
        CtKey, CtValue, CT_F_CLOSING, CT_F_DSR, CT_F_LOCAL, CT_F_SNAT, CT_REVERSE, CT_SERVICE,
    },
    filter::{filter_bit, fold6, word_and_mask},
    maps as names,
    nodeport::{flow_hash, flow_hash6, mode_of, MODE_DSR, MODE_HYBRID},
    service::{
        Service4Key, Service6Key, ServiceValue, SourceRange4, SourceRange6, ALG_MAGLEV, SCOPE_ALL,
        SCOPE_LOCAL, SVC_FLAG_AFFINITY, SVC_FLAG_FORWARD_DSR, SVC_FLAG_FORWARD_SNAT,
        SVC_FLAG_HOST_LOOPBACK, SVC_FLAG_SOURCE_RANGES, SVC_FLAG_TWO_SCOPES, SVC_FLAG_VIP_MARKER,
    },
    Addr6,
};
use serde::Serialize;

use crate::{
    datapath::config::{ConfigSlots as _, RuntimeConfig},
    maps::{
        bpf::open_pinned,
        convert::{
            backend_from4, backend_from6, ip4_from_map, ip4_to_map, ip6_from_map, ip6_to_map,
            port_from_map,
        },
        BackendEntry,
    },
    model::Protocol,
};

/// What the data path does with the packet.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// Not for a frontend: left to the stack.
    Pass,
    /// Dropped, counted under this reason (`lbctl drops`).
    Drop,
    /// Answered with an ICMP port unreachable (no backend at all).
    Reject,
    /// Sent to a backend.
    Forward,
}

/// Why that backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Because {
    /// The flow's live conntrack entry.
    Conntrack,
    /// The client's sessionAffinity entry.
    Affinity,
    /// The flow's Maglev slot.
    Maglev,
    /// A new flow of a service choosing at random: one of `candidates`.
    Random,
    /// A backend's reply to a SNAT flow, back to its client.
    SnatReply,
}

#[derive(Clone, Debug, Serialize)]
pub struct TraceBackend {
    pub id: u32,
    pub address: String,
    pub local: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct Trace {
    pub verdict: Verdict,
    /// The drop reason (`Verdict::Drop`), as `lbctl drops` names it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_id: Option<u32>,
    /// The node-local view of an externalTrafficPolicy: Local frontend.
    pub local_view: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub because: Option<Because>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backend: Option<TraceBackend>,
    /// `Because::Maglev`: the slot and the table's size.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub maglev_slot: Option<(u32, u32)>,
    /// `Because::Random`: every backend the choice may give.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub candidates: Vec<TraceBackend>,
    /// How a remote backend is reached: "snat", "dsr" or "local".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forwarding: Option<&'static str>,
    /// Each step, as a sentence.
    pub steps: Vec<String>,
}

impl Trace {
    fn new() -> Self {
        Self {
            verdict: Verdict::Pass,
            reason: None,
            service_id: None,
            local_view: false,
            because: None,
            backend: None,
            maglev_slot: None,
            candidates: Vec::new(),
            forwarding: None,
            steps: Vec::new(),
        }
    }

    fn step(&mut self, s: impl Into<String>) {
        self.steps.push(s.into());
    }

    fn end(mut self, verdict: Verdict, reason: Option<&'static str>, s: impl Into<String>) -> Self {
        self.verdict = verdict;
        self.reason = reason;
        self.step(s);
        self
    }
}

/// One family's maps and key shapes.
trait Family {
    type Addr: Pod + Copy + Eq;
    type Key: Pod;
    type Backend: Pod;
    type Range: Pod;
    const SERVICES: &'static str;
    const BACKENDS: &'static str;
    const CT: &'static str;
    const SRC_RANGES: &'static str;
    fn addr(ip: IpAddr) -> Option<Self::Addr>;
    fn key(addr: Self::Addr, port: u16, proto: u8, scope: u8, slot: u16) -> Self::Key;
    fn entry(b: &Self::Backend) -> BackendEntry;
    fn hash(f: &Tuple<Self::Addr>) -> u32;
    fn client(saddr: Self::Addr) -> u64;
    fn range(service_id: u32, saddr: Self::Addr) -> LpmKey<Self::Range>;
    /// The address as the frontend filter folds it (`lb_common::filter`).
    fn fold(a: Self::Addr) -> u32;
    /// A backend entry's address and port as conntrack keeps them.
    fn backend_raw(b: &Self::Backend) -> (Self::Addr, u16);
    /// An address and port as the maps keep them, as a socket address.
    fn socket(a: Self::Addr, port: u16) -> SocketAddr;
}

/// The packet's tuple as the maps keep it (network byte order).
struct Tuple<A> {
    saddr: A,
    daddr: A,
    sport: u16,
    dport: u16,
    proto: u8,
}

struct V4;
struct V6;

impl Family for V4 {
    type Addr = u32;
    type Key = Service4Key;
    type Backend = Backend4;
    type Range = SourceRange4;
    const SERVICES: &'static str = names::LB4_SERVICES;
    const BACKENDS: &'static str = names::LB4_BACKENDS;
    const CT: &'static str = names::LB4_CT;
    const SRC_RANGES: &'static str = names::LB4_SRC_RANGES;
    fn addr(ip: IpAddr) -> Option<u32> {
        match ip {
            IpAddr::V4(a) => Some(ip4_to_map(a)),
            IpAddr::V6(_) => None,
        }
    }
    fn key(addr: u32, port: u16, proto: u8, scope: u8, slot: u16) -> Service4Key {
        Service4Key::new(addr, port, proto, scope, slot)
    }
    fn entry(b: &Backend4) -> BackendEntry {
        backend_from4(b)
    }
    fn hash(f: &Tuple<u32>) -> u32 {
        flow_hash(f.saddr, f.daddr, f.sport, f.dport, f.proto)
    }
    fn client(saddr: u32) -> u64 {
        address_client4(saddr)
    }
    fn range(service_id: u32, saddr: u32) -> LpmKey<SourceRange4> {
        LpmKey::new(
            SourceRange4::prefix_len(32),
            SourceRange4 {
                service_id,
                address: saddr,
            },
        )
    }
    fn fold(a: u32) -> u32 {
        a
    }
    fn backend_raw(b: &Backend4) -> (u32, u16) {
        (b.address, b.port)
    }
    fn socket(a: u32, port: u16) -> SocketAddr {
        SocketAddr::from((ip4_from_map(a), port_from_map(port)))
    }
}

impl Family for V6 {
    type Addr = Addr6;
    type Key = Service6Key;
    type Backend = Backend6;
    type Range = SourceRange6;
    const SERVICES: &'static str = names::LB6_SERVICES;
    const BACKENDS: &'static str = names::LB6_BACKENDS;
    const CT: &'static str = names::LB6_CT;
    const SRC_RANGES: &'static str = names::LB6_SRC_RANGES;
    fn addr(ip: IpAddr) -> Option<Addr6> {
        match ip {
            IpAddr::V6(a) => Some(ip6_to_map(a)),
            IpAddr::V4(_) => None,
        }
    }
    fn key(addr: Addr6, port: u16, proto: u8, scope: u8, slot: u16) -> Service6Key {
        Service6Key::new(addr, port, proto, scope, slot)
    }
    fn entry(b: &Backend6) -> BackendEntry {
        backend_from6(b)
    }
    fn hash(f: &Tuple<Addr6>) -> u32 {
        flow_hash6(f.saddr, f.daddr, f.sport, f.dport, f.proto)
    }
    fn client(saddr: Addr6) -> u64 {
        address_client6(saddr)
    }
    fn range(service_id: u32, saddr: Addr6) -> LpmKey<SourceRange6> {
        LpmKey::new(
            SourceRange6::prefix_len(128),
            SourceRange6 {
                service_id,
                address: saddr,
            },
        )
    }
    fn fold(a: Addr6) -> u32 {
        fold6(a)
    }
    fn backend_raw(b: &Backend6) -> (Addr6, u16) {
        (b.address, b.port)
    }
    fn socket(a: Addr6, port: u16) -> SocketAddr {
        SocketAddr::from((ip6_from_map(a), port_from_map(port)))
    }
}

/// Traces a packet of `protocol` from `source` to `destination`, arriving
/// from outside the node (not from a pod), as a TCP SYN or a UDP datagram.
pub fn trace(
    pin_dir: &std::path::Path,
    protocol: Protocol,
    source: SocketAddr,
    destination: SocketAddr,
    now_ns: u64,
) -> anyhow::Result<Trace> {
    match (source.ip(), destination.ip()) {
        (IpAddr::V4(_), IpAddr::V4(_)) => {
            trace_in::<V4>(pin_dir, protocol, source, destination, now_ns)
        }
        (IpAddr::V6(_), IpAddr::V6(_)) => {
            trace_in::<V6>(pin_dir, protocol, source, destination, now_ns)
        }
        _ => anyhow::bail!(
            "{source} and {destination} are of two families: give both as IPv4 or both as IPv6"
        ),
    }
}

fn backend_of<F: Family>(
    backends: &HashMap<MapData, u32, F::Backend>,
    id: u32,
) -> Option<TraceBackend> {
    let b = backends.get(&id, 0).ok()?;
    let e = F::entry(&b);
    Some(TraceBackend {
        id,
        address: SocketAddr::new(e.address, e.port).to_string(),
        local: e.flags & BACKEND_FLAG_LOCAL != 0,
    })
}

fn trace_in<F: Family>(
    pin_dir: &std::path::Path,
    protocol: Protocol,
    source: SocketAddr,
    destination: SocketAddr,
    now_ns: u64,
) -> anyhow::Result<Trace>
where
    CtKey<F::Addr>: Pod,
    CtValue<F::Addr>: Pod,
{
    let services: HashMap<MapData, F::Key, ServiceValue> =
        HashMap::try_from(open_pinned(pin_dir, F::SERVICES)?)?;
    let backends: HashMap<MapData, u32, F::Backend> =
        HashMap::try_from(open_pinned(pin_dir, F::BACKENDS)?)?;
    let config = RuntimeConfig::open(pin_dir)?;
    let proto = protocol.number();
    let t = Tuple {
        saddr: F::addr(source.ip()).expect("same family"),
        daddr: F::addr(destination.ip()).expect("same family"),
        sport: source.port().to_be(),
        dport: destination.port().to_be(),
        proto,
    };
    let mut tr = Trace::new();
    let fe = format!("{destination}/{}", protocol.as_str());

    // The early exit (packet::early_exit): with the frontend filter
    // trusted, a packet to no frontend's bits and outside every SNAT range
    // used goes before any lookup.
    let snat = snat_ports_ever(&config)?;
    let in_snat = (snat.0..=snat.1).contains(&u32::from(destination.port()));
    let filter: Array<MapData, u64> = Array::try_from(open_pinned(pin_dir, names::LB4_FE_FILTER)?)?;
    let filter_has = |port: u16| {
        let (word, mask) = word_and_mask(filter_bit(F::fold(t.daddr), port));
        filter.get(&word, 0).map_or(true, |w| w & mask != 0)
    };
    if config.get(CFG_FRONTEND_FILTER)? != 0 && !filter_has(t.dport) && !in_snat && !filter_has(0) {
        return Ok(tr.end(Verdict::Pass, None, format!("{fe}: no frontend there (the frontend filter's bits are clear) and the port is outside the SNAT ranges: left to the stack before any lookup")));
    }

    // A reply to a SNAT flow and a known flow, before the frontend: a
    // flow keeps its backend while its entry lives, whatever became of its
    // frontend (packet::ingress_of; the reply first for a port of the SNAT
    // range).
    let ct: HashMap<MapData, CtKey<F::Addr>, CtValue<F::Addr>> =
        HashMap::try_from(open_pinned(pin_dir, F::CT)?)?;
    let timeouts = crate::conntrack::timeouts(&config)?;
    let live = |key: &CtKey<F::Addr>| {
        ct.get(key, 0)
            .ok()
            .filter(|v| !crate::conntrack::expired(key, v, now_ns, &timeouts))
    };
    let reply_key = CtKey::new(t.saddr, t.daddr, t.sport, t.dport, proto, CT_REVERSE);
    let reply = || live(&reply_key).filter(|v| v.flags & CT_F_SNAT != 0);
    if in_snat {
        if let Some(r) = reply() {
            return Ok(snat_reply::<F>(tr, &r));
        }
    }
    let ckey = CtKey::new(t.saddr, t.daddr, t.sport, t.dport, proto, CT_SERVICE);
    match live(&ckey) {
        // A SYN on a closing flow's tuple starts a new flow (ct::lookup).
        Some(e) if proto == Protocol::Tcp.number() && e.flags & CT_F_CLOSING != 0 => {
            tr.step("its conntrack entry is closing: a SYN on the tuple starts a new flow");
        }
        Some(e) => {
            let gen = backends_gen(pin_dir)?;
            let same = backends
                .get(&e.backend_id, 0)
                .is_ok_and(|b| F::backend_raw(&b) == (e.addr, e.port));
            if e.backends_gen == gen || same {
                let b = TraceBackend {
                    id: e.backend_id,
                    address: F::socket(e.addr, e.port).to_string(),
                    local: e.flags & CT_F_LOCAL != 0,
                };
                let left = crate::conntrack::remaining_s(&ckey, &e, now_ns, &timeouts);
                tr.service_id = Some(e.service_id);
                tr.step(format!("a live conntrack entry of frontend {} ({left} s left without traffic) holds the flow on backend {} {}", e.service_id, b.id, b.address));
                tr.because = Some(Because::Conntrack);
                tr.forwarding = Some(if e.flags & CT_F_LOCAL != 0 {
                    "local"
                } else if e.flags & CT_F_DSR != 0 {
                    "dsr"
                } else if e.flags & CT_F_SNAT != 0 {
                    "snat"
                } else {
                    "local"
                });
                tr.backend = Some(b);
                return Ok(tr.end(
                    Verdict::Forward,
                    None,
                    "forwarded as the flow's first packet was",
                ));
            }
            tr.step(format!("its conntrack entry names backend {}, which is gone (or its id names another backend now): the flow chooses again", e.backend_id));
        }
        None => tr.step("no live conntrack entry: a new flow"),
    }
    if !in_snat {
        if let Some(r) = reply() {
            return Ok(snat_reply::<F>(tr, &r));
        }
    }

    // The frontend (select::lookup_service), then its node-local view.
    let key = F::key(t.daddr, t.dport, proto, SCOPE_ALL, 0);
    let Ok(svc) = services.get(&key, 0) else {
        let marker = F::key(t.daddr, 0, 0, SCOPE_ALL, 0);
        return Ok(match services.get(&marker, 0) {
            Ok(m) if m.flags & SVC_FLAG_VIP_MARKER != 0 => tr.end(
                Verdict::Drop,
                Some("no-service-port"),
                format!(
                    "{} is a service address, but not on port {}/{}: dropped (no-service-port)",
                    destination.ip(),
                    destination.port(),
                    protocol.as_str()
                ),
            ),
            _ => tr.end(
                Verdict::Pass,
                None,
                format!("{fe} is no frontend: left to the stack"),
            ),
        });
    };
    if svc.flags & SVC_FLAG_HOST_LOOPBACK != 0 {
        return Ok(tr.end(Verdict::Pass, None, format!("{fe} is a NodePort for the node's own processes only: a packet from outside is the stack's (it drops it as a martian)")));
    }
    tr.service_id = Some(svc.service_id);
    tr.step(format!(
        "{fe} is frontend {} ({})",
        svc.service_id,
        super::service_list::type_name(svc.flags)
    ));
    let svc = if svc.flags & SVC_FLAG_TWO_SCOPES != 0 {
        let local = F::key(t.daddr, t.dport, proto, SCOPE_LOCAL, 0);
        match services.get(&local, 0) {
            Ok(l) => {
                tr.local_view = true;
                tr.service_id = Some(l.service_id);
                tr.step(format!("externalTrafficPolicy: Local: traffic from outside uses its node-local view, frontend {}", l.service_id));
                l
            }
            Err(_) => {
                return Ok(tr.end(
                    Verdict::Pass,
                    None,
                    "its node-local view is missing: left to the stack",
                ))
            }
        }
    } else {
        svc
    };

    // loadBalancerSourceRanges (I::admits).
    if svc.flags & SVC_FLAG_SOURCE_RANGES != 0 {
        let ranges: LpmTrie<MapData, F::Range, u8> =
            LpmTrie::try_from(open_pinned(pin_dir, F::SRC_RANGES)?)?;
        if ranges.get(&F::range(svc.service_id, t.saddr), 0).is_err() {
            return Ok(tr.end(Verdict::Drop, Some("source-range"), format!("{} is in none of the frontend's loadBalancerSourceRanges: dropped (source-range)", source.ip())));
        }
        tr.step(format!(
            "{} is in the frontend's loadBalancerSourceRanges",
            source.ip()
        ));
    }

    // No backend to choose (new_flow::no_backend).
    if svc.count == 0 && svc.terminating_count == 0 {
        if tr.local_view {
            let all = services.get(&F::key(t.daddr, t.dport, proto, SCOPE_ALL, 0), 0);
            if all.is_ok_and(|s| s.count > 0 || s.terminating_count > 0) {
                return Ok(tr.end(Verdict::Drop, Some("no-local-backend"), "no backend on this node (externalTrafficPolicy: Local; other nodes have some): dropped (no-local-backend)"));
            }
        }
        return Ok(tr.end(
            Verdict::Reject,
            None,
            "no backend at all: answered with ICMP port unreachable, as kube-proxy's REJECT",
        ));
    }

    // sessionAffinity: the client's last backend (select::remembered).
    if svc.flags & SVC_FLAG_AFFINITY != 0 {
        let groups: HashMap<MapData, u32, u32> =
            HashMap::try_from(open_pinned(pin_dir, names::LB_AFFINITY_GROUP)?)?;
        let group = groups.get(&svc.service_id, 0).unwrap_or(svc.service_id);
        let memory: HashMap<MapData, AffinityKey, AffinityValue> =
            HashMap::try_from(open_pinned(pin_dir, names::LB_AFFINITY)?)?;
        let matches: HashMap<MapData, AffinityMatchKey, u8> =
            HashMap::try_from(open_pinned(pin_dir, names::LB_AFFINITY_MATCH)?)?;
        let akey = AffinityKey {
            client: F::client(t.saddr),
            service_id: group,
            pad: 0,
        };
        match memory.get(&akey, 0) {
            Ok(a) => {
                // The programs read bpf_ktime_get_ns (CLOCK_MONOTONIC).
                let age_ns = now_ns.saturating_sub(a.last_used_ns);
                let age_s = age_ns / 1_000_000_000;
                let fresh = age_ns <= u64::from(svc.affinity_timeout_s) * 1_000_000_000;
                let member = matches
                    .get(
                        &AffinityMatchKey {
                            service_id: svc.service_id,
                            backend_id: a.backend_id,
                        },
                        0,
                    )
                    .is_ok();
                match backend_of::<F>(&backends, a.backend_id) {
                    Some(b) if fresh && member => {
                        tr.step(format!("sessionAffinity: {} last used backend {} {} {age_s} s ago (timeout {} s)", source.ip(), b.id, b.address, svc.affinity_timeout_s));
                        tr.because = Some(Because::Affinity);
                        tr.forwarding = Some(forwarding(&svc, &b, protocol, &config)?);
                        tr.backend = Some(b);
                        return Ok(tr.end(Verdict::Forward, None, "forwarded to it"));
                    }
                    _ if !fresh => tr.step(format!("sessionAffinity: the client's entry is {age_s} s old, past the {} s timeout: chosen again", svc.affinity_timeout_s)),
                    _ => tr.step(format!("sessionAffinity: the client's backend {} may no longer be chosen: chosen again", a.backend_id)),
                }
            }
            Err(_) => tr.step(
                "sessionAffinity: no entry for the client yet: the choice below is remembered",
            ),
        }
    }

    // The choice: Maglev slot, or random among the selectable slots.
    if svc.algorithm == ALG_MAGLEV {
        let m = match svc.maglev_size {
            0 => config.get(CFG_MAGLEV_M)?,
            code => lb_common::maps::maglev_size_of(code).unwrap_or(0),
        };
        if m == 0 {
            return Ok(tr.end(
                Verdict::Drop,
                Some("maglev-missing"),
                "the Maglev table's size is unknown: dropped (maglev-missing)",
            ));
        }
        let slot = F::hash(&t) % m;
        tr.maglev_slot = Some((slot, m));
        let tables: HashOfMaps<MapData, u32, Array<MapData, u32>> =
            HashOfMaps::try_from(open_pinned(pin_dir, names::LB_MAGLEV)?)?;
        let id = tables
            .get(&svc.service_id, 0)
            .ok()
            .and_then(|inner| inner.get(&slot, 0).ok());
        let Some(id) = id else {
            return Ok(tr.end(
                Verdict::Drop,
                Some("maglev-missing"),
                format!("Maglev slot {slot} of {m}: no table entry: dropped (maglev-missing)"),
            ));
        };
        let Some(b) = backend_of::<F>(&backends, id) else {
            return Ok(tr.end(Verdict::Drop, Some("backend-missing"), format!("Maglev slot {slot} of {m} names backend {id}, which is not in the backends map: dropped (backend-missing)")));
        };
        tr.step(format!(
            "Maglev: the flow's hash gives slot {slot} of {m}: backend {} {}",
            b.id, b.address
        ));
        tr.because = Some(Because::Maglev);
        tr.forwarding = Some(forwarding(&svc, &b, protocol, &config)?);
        tr.backend = Some(b);
        return Ok(tr.end(Verdict::Forward, None, "forwarded to it"));
    }
    let (first, n, which) = if svc.count > 0 {
        (1, svc.count, "active")
    } else {
        (
            1 + svc.count,
            svc.terminating_count,
            "terminating (no active one)",
        )
    };
    let mut missing = Vec::new();
    let scope = if tr.local_view {
        SCOPE_LOCAL
    } else {
        SCOPE_ALL
    };
    for slot in first..first + n {
        let b = services
            .get(&F::key(t.daddr, t.dport, proto, scope, slot), 0)
            .ok()
            .and_then(|v| backend_of::<F>(&backends, v.backend_id));
        match b {
            Some(b) => tr.candidates.push(b),
            None => missing.push(slot),
        }
    }
    tr.because = Some(Because::Random);
    let mut list = Vec::new();
    let mut modes = std::collections::BTreeSet::new();
    for b in &tr.candidates {
        let mode = forwarding(&svc, b, protocol, &config)?;
        modes.insert(mode);
        list.push(format!("{} {} ({mode})", b.id, b.address));
    }
    tr.step(format!(
        "random among the {n} {which} backends: {}",
        list.join(", ")
    ));
    if !missing.is_empty() {
        tr.step(format!("slots {missing:?} name no backend in the backends map: a choice of one is dropped (backend-missing)"));
    }
    if tr.candidates.is_empty() {
        return Ok(tr.end(
            Verdict::Drop,
            Some("backend-missing"),
            "no slot names a backend: dropped (backend-missing)",
        ));
    }
    // One mode for all, or per candidate above.
    if let [mode] = modes.into_iter().collect::<Vec<_>>().as_slice() {
        tr.forwarding = Some(mode);
    }
    if let [only] = tr.candidates.as_slice() {
        tr.backend = Some(only.clone());
    }
    Ok(tr.end(Verdict::Forward, None, "forwarded to the one chosen"))
}

/// A backend's reply to a SNAT flow: translated back to its client.
fn snat_reply<F: Family>(mut tr: Trace, r: &CtValue<F::Addr>) -> Trace {
    tr.service_id = Some(r.service_id);
    tr.because = Some(Because::SnatReply);
    tr.forwarding = Some("snat");
    let client = F::socket(r.nat_addr, r.nat_port);
    tr.step(format!("a reply to a SNAT flow of frontend {}: its reverse conntrack entry gives the client {client}", r.service_id));
    tr.end(
        Verdict::Forward,
        None,
        format!("translated back and sent to {client}"),
    )
}

/// The SNAT port range every flow still in conntrack may use
/// (`CFG_SNAT_PORTS_EVER`, else the current one), as the early exit reads it.
fn snat_ports_ever(config: &RuntimeConfig) -> anyhow::Result<(u32, u32)> {
    let ever = config.get(CFG_SNAT_PORTS_EVER)?;
    Ok(if ever != 0 {
        (ever >> 16, ever & 0xffff)
    } else {
        (
            config.get(CFG_SNAT_PORT_MIN)?,
            config.get(CFG_SNAT_PORT_MAX)?,
        )
    })
}

/// The low 16 bits of the backends' generation, as conntrack keeps them.
fn backends_gen(pin_dir: &std::path::Path) -> anyhow::Result<u16> {
    if !pin_dir.join(names::LB_BACKENDS_GEN).exists() {
        return Ok(0);
    }
    let gen: Array<MapData, u32> = Array::try_from(open_pinned(pin_dir, names::LB_BACKENDS_GEN)?)?;
    Ok(gen.get(&0, 0).context("reading LB_BACKENDS_GEN")? as u16)
}

/// How the packet reaches `b`: DNAT to a local backend, else the
/// frontend's forwarding mode or the agent's (`--lb-mode`).
fn forwarding(
    svc: &ServiceValue,
    b: &TraceBackend,
    protocol: Protocol,
    config: &RuntimeConfig,
) -> anyhow::Result<&'static str> {
    if b.local {
        return Ok("local");
    }
    if svc.flags & SVC_FLAG_FORWARD_DSR != 0 {
        return Ok("dsr");
    }
    if svc.flags & SVC_FLAG_FORWARD_SNAT != 0 {
        return Ok("snat");
    }
    let mode = mode_of(
        config
            .get(CFG_LB_MODE)
            .context("reading the agent's --lb-mode")?,
    );
    Ok(match mode {
        MODE_DSR => "dsr",
        MODE_HYBRID if protocol == Protocol::Udp => "snat",
        MODE_HYBRID => "dsr",
        _ => "snat",
    })
}

/// The steps, one per line, under the verdict.
pub fn render(t: &Trace) -> String {
    let mut out = String::new();
    for (i, s) in t.steps.iter().enumerate() {
        out.push_str(&format!("{}. {s}\n", i + 1));
    }
    let verdict = match (&t.verdict, &t.backend) {
        (Verdict::Forward, Some(b)) => format!(
            "=> forward to backend {} {} ({})",
            b.id,
            b.address,
            t.forwarding.unwrap_or("?")
        ),
        (Verdict::Forward, None) => "=> forward to one of the backends above".to_string(),
        (Verdict::Drop, _) => format!("=> drop ({})", t.reason.unwrap_or("?")),
        (Verdict::Reject, _) => "=> reject (ICMP port unreachable)".to_string(),
        (Verdict::Pass, _) => "=> pass to the stack".to_string(),
    };
    out.push_str(&verdict);
    out.push('\n');
    out
}
