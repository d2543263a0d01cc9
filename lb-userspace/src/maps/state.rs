//! `MapState`: the contents of the agent-written maps, plus indexes derived
//! from them (backend references, ClusterIP addresses) kept up to date on
//! every operation so a diff never has to scan the whole table.
use std::{collections::BTreeSet, net::IpAddr, sync::Arc};

use crate::collections::HashMap;
use lb_common::service::{SCOPE_ALL, SVC_FLAG_CLUSTER_IP, SVC_FLAG_VIP_MARKER};

use super::{BackendEntry, Family, MapOp, RevNatEntry, ServiceValue, SvcKey};
use crate::net::Cidr;

#[derive(Clone, Debug, Default)]
pub struct MapState {
    pub services: HashMap<SvcKey, ServiceValue>,
    pub backends: HashMap<u32, BackendEntry>,
    pub revnat: HashMap<u32, RevNatEntry>,
    /// LB_AFFINITY_MATCH: service id → backends it may select.
    pub affinity: HashMap<u32, BTreeSet<u32>>,
    affinity_entries: usize,
    /// LB_AFFINITY_GROUP: service id → the id its affinity memory is kept under.
    pub affinity_groups: HashMap<u32, u32>,
    /// LB_MAGLEV: service id → its table.
    pub maglev: HashMap<u32, Arc<Vec<u32>>>,
    /// LB4_SRC_RANGES: service id → its loadBalancerSourceRanges.
    pub source_ranges: HashMap<u32, BTreeSet<Cidr>>,
    /// Source-range entries per family (LB4_SRC_RANGES, LB6_SRC_RANGES).
    source_range_entries: [usize; 2],
    /// backend id → number of slots naming it.
    backend_refs: HashMap<u32, u32>,
    /// address → number of ClusterIP frontends on it (the VIP marker's users).
    vip_refs: HashMap<IpAddr, u32>,
    /// Entries per family (v4, v6): services, backends, revnat.
    sizes: [Sizes; 2],
    /// LB4_FE_FILTER as written: word index → word (zero words absent).
    pub filter_words: HashMap<u32, u64>,
    /// Whether the programs trust the filter (CFG_FRONTEND_FILTER).
    pub filter_trusted: bool,
    /// filter bit → frontend entries (slot 0, markers included) on it.
    filter_refs: HashMap<u32, u32>,
}

/// Entries of one family's services, backends and reverse-NAT maps.
#[derive(Clone, Copy, Debug, Default)]
struct Sizes {
    services: usize,
    backends: usize,
    revnat: usize,
}

fn fam(address: &IpAddr) -> usize {
    if address.is_ipv4() {
        0
    } else {
        1
    }
}

impl PartialEq for MapState {
    /// Equal contents; the indexes follow from them.
    fn eq(&self, other: &Self) -> bool {
        self.services == other.services
            && self.backends == other.backends
            && self.revnat == other.revnat
            && self.affinity == other.affinity
            && self.affinity_groups == other.affinity_groups
            && self.maglev == other.maglev
            && self.source_ranges == other.source_ranges
            && self.filter_words == other.filter_words
            && self.filter_trusted == other.filter_trusted
    }
}
impl Eq for MapState {}

/// The LB4_FE_FILTER bit of a services-map key the packet programs look
/// up first (a frontend's master entry or an address marker, IPv6 folded
/// to 32 bits); None for backend slots.
pub fn filter_bit(k: &SvcKey) -> Option<u32> {
    match k.address {
        IpAddr::V4(a) if k.slot == 0 => Some(lb_common::filter::filter_bit(
            u32::from_ne_bytes(a.octets()),
            k.port.to_be(),
        )),
        IpAddr::V6(a) if k.slot == 0 => Some(lb_common::filter::filter_bit(
            lb_common::filter::fold6(super::convert::ip6_to_map(a)),
            k.port.to_be(),
        )),
        _ => None,
    }
}

impl MapState {
    /// Whether a frontend entry uses this filter bit.
    pub fn filter_bit_used(&self, bit: u32) -> bool {
        self.filter_refs.contains_key(&bit)
    }

    /// How many frontend entries use this filter bit.
    pub fn filter_users(&self, bit: u32) -> u32 {
        self.filter_refs.get(&bit).copied().unwrap_or(0)
    }

    /// Whether the filter as written has this bit set.
    pub fn filter_bit_set(&self, bit: u32) -> bool {
        let (word, mask) = lb_common::filter::word_and_mask(bit);
        self.filter_words.get(&word).is_some_and(|w| w & mask != 0)
    }

    /// The words the filter should hold for the entries present: one bit
    /// per used bit.
    pub fn filter_wanted(&self) -> HashMap<u32, u64> {
        let mut words: HashMap<u32, u64> = HashMap::default();
        for bit in self.filter_refs.keys() {
            let (word, mask) = lb_common::filter::word_and_mask(*bit);
            *words.entry(word).or_default() |= mask;
        }
        words
    }
}

/// The marker entry that says "this address is a ClusterIP".
pub fn vip_marker_key(address: IpAddr) -> SvcKey {
    SvcKey::new(address, 0, 0, SCOPE_ALL)
}

pub fn is_marker(key: &SvcKey, value: &ServiceValue) -> bool {
    key.slot == 0 && key.port == 0 && key.proto == 0 && value.flags & SVC_FLAG_VIP_MARKER != 0
}

fn counts_as_vip(key: &SvcKey, value: &ServiceValue) -> bool {
    key.slot == 0
        && key.scope == SCOPE_ALL
        && value.flags & SVC_FLAG_CLUSTER_IP != 0
        && !is_marker(key, value)
}

impl MapState {
    pub fn from_entries(
        services: impl IntoIterator<Item = (SvcKey, ServiceValue)>,
        backends: impl IntoIterator<Item = (u32, BackendEntry)>,
        revnat: impl IntoIterator<Item = (u32, RevNatEntry)>,
        affinity: impl IntoIterator<Item = (u32, u32)>,
        maglev: impl IntoIterator<Item = (u32, Vec<u32>)>,
        source_ranges: impl IntoIterator<Item = (u32, Cidr)>,
        affinity_groups: impl IntoIterator<Item = (u32, u32)>,
    ) -> Self {
        let mut state = MapState::default();
        for (k, v) in services {
            state.apply(&MapOp::UpsertService(k, v));
        }
        for (id, b) in backends {
            state.apply(&MapOp::UpsertBackend(id, b));
        }
        for (id, r) in revnat {
            state.apply(&MapOp::UpsertRevNat(id, r));
        }
        for (svc, backend) in affinity {
            state.apply(&MapOp::UpsertAffinityMatch(svc, backend));
        }
        for (svc, table) in maglev {
            state.apply(&MapOp::SetMaglev(svc, Arc::new(table)));
        }
        for (svc, range) in source_ranges {
            state.apply(&MapOp::UpsertSourceRange(svc, range));
        }
        for (svc, group) in affinity_groups {
            state.apply(&MapOp::SetAffinityGroup(svc, group));
        }
        state
    }

    pub fn apply(&mut self, op: &MapOp) {
        match op.clone() {
            MapOp::SetMaglev(svc, table) => {
                self.maglev.insert(svc, table);
            }
            MapOp::SetAffinityGroup(svc, group) => {
                self.affinity_groups.insert(svc, group);
            }
            MapOp::DeleteAffinityGroup(svc) => {
                self.affinity_groups.remove(&svc);
            }
            MapOp::DeleteMaglev(svc) => {
                self.maglev.remove(&svc);
            }
            MapOp::UpsertSourceRange(svc, range) => {
                if self.source_ranges.entry(svc).or_default().insert(range) {
                    self.source_range_entries[fam(&range.address)] += 1;
                }
            }
            MapOp::DeleteSourceRange(svc, range) => {
                if let Some(set) = self.source_ranges.get_mut(&svc) {
                    if set.remove(&range) {
                        self.source_range_entries[fam(&range.address)] -= 1;
                    }
                    if set.is_empty() {
                        self.source_ranges.remove(&svc);
                    }
                }
            }
            MapOp::UpsertBackend(id, b) => {
                if let Some(old) = self.backends.insert(id, b) {
                    self.sizes[fam(&old.address)].backends -= 1;
                }
                self.sizes[fam(&b.address)].backends += 1;
            }
            MapOp::DeleteBackend(id, _) => {
                if let Some(old) = self.backends.remove(&id) {
                    self.sizes[fam(&old.address)].backends -= 1;
                }
            }
            MapOp::UpsertRevNat(id, r) => {
                if let Some(old) = self.revnat.insert(id, r) {
                    self.sizes[fam(&old.address)].revnat -= 1;
                }
                self.sizes[fam(&r.address)].revnat += 1;
            }
            MapOp::DeleteRevNat(id, _) => {
                if let Some(old) = self.revnat.remove(&id) {
                    self.sizes[fam(&old.address)].revnat -= 1;
                }
            }
            MapOp::UpsertAffinityMatch(svc, backend) => {
                if self.affinity.entry(svc).or_default().insert(backend) {
                    self.affinity_entries += 1;
                }
            }
            MapOp::DeleteAffinityMatch(svc, backend) => {
                if let Some(set) = self.affinity.get_mut(&svc) {
                    if set.remove(&backend) {
                        self.affinity_entries -= 1;
                    }
                    if set.is_empty() {
                        self.affinity.remove(&svc);
                    }
                }
            }
            MapOp::UpsertService(k, v) => {
                match self.services.insert(k, v) {
                    Some(old) => self.unindex(&k, &old),
                    None => {
                        self.sizes[fam(&k.address)].services += 1;
                        if let Some(bit) = filter_bit(&k) {
                            *self.filter_refs.entry(bit).or_default() += 1;
                        }
                    }
                }
                self.index(&k, &v);
            }
            MapOp::DeleteService(k) => {
                if let Some(old) = self.services.remove(&k) {
                    self.unindex(&k, &old);
                    self.sizes[fam(&k.address)].services -= 1;
                    if let Some(bit) = filter_bit(&k) {
                        if let Some(n) = self.filter_refs.get_mut(&bit) {
                            *n -= 1;
                            if *n == 0 {
                                self.filter_refs.remove(&bit);
                            }
                        }
                    }
                }
            }
            MapOp::SetFilterWord(i, w) => {
                if w == 0 {
                    self.filter_words.remove(&i);
                } else {
                    self.filter_words.insert(i, w);
                }
            }
            MapOp::TrustFilter(t) => self.filter_trusted = t,
        }
    }

    fn index(&mut self, k: &SvcKey, v: &ServiceValue) {
        if k.slot > 0 {
            *self.backend_refs.entry(v.backend_id).or_default() += 1;
        } else if counts_as_vip(k, v) {
            *self.vip_refs.entry(k.address).or_default() += 1;
        }
    }

    fn unindex(&mut self, k: &SvcKey, v: &ServiceValue) {
        fn dec<K: std::hash::Hash + Eq>(map: &mut HashMap<K, u32>, key: K) {
            if let Some(n) = map.get_mut(&key) {
                *n -= 1;
                if *n == 0 {
                    map.remove(&key);
                }
            }
        }
        if k.slot > 0 {
            dec(&mut self.backend_refs, v.backend_id);
        } else if counts_as_vip(k, v) {
            dec(&mut self.vip_refs, k.address);
        }
    }

    pub fn backend_refs(&self, id: u32) -> u32 {
        self.backend_refs.get(&id).copied().unwrap_or(0)
    }

    pub fn vip_refs(&self, address: IpAddr) -> u32 {
        self.vip_refs.get(&address).copied().unwrap_or(0)
    }

    pub fn has_marker(&self, address: IpAddr) -> bool {
        let k = vip_marker_key(address);
        self.services.get(&k).is_some_and(|v| is_marker(&k, v))
    }

    /// Master entries of real frontends (not VIP markers).
    pub fn frontends(&self) -> impl Iterator<Item = (&SvcKey, &ServiceValue)> {
        self.services
            .iter()
            .filter(|(k, v)| k.slot == 0 && !is_marker(k, v))
    }

    /// Backend ids in slot order (active first, then terminating).
    pub fn slots_of(&self, master: &SvcKey) -> Vec<u32> {
        let Some(m) = self.services.get(master) else {
            return Vec::new();
        };
        let total = m.master_slots();
        (1..=total)
            .filter_map(|slot| {
                self.services
                    .get(&master.with_slot(slot as u16))
                    .map(|v| v.backend_id)
            })
            .collect()
    }

    /// Source-range entries of both families (the capacity check counts
    /// them together).
    pub fn source_range_entries(&self) -> usize {
        self.source_range_entries.iter().sum()
    }

    /// Source-range entries of one family's map.
    pub fn source_range_entries_of(&self, family: Family) -> usize {
        self.source_range_entries[usize::from(family == Family::V6)]
    }

    pub fn affinity_entries(&self) -> usize {
        self.affinity_entries
    }

    /// Entries per family: (services, backends, revnat).
    pub fn counts(&self, family: Family) -> (usize, usize, usize) {
        let c = self.sizes[family as usize];
        (c.services, c.backends, c.revnat)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each family's source-range map is counted on its own, and together
    /// for the capacity check; an entry written twice counts once.
    #[test]
    fn source_range_entries_are_counted_per_family() {
        let mut s = MapState::default();
        let v4: Cidr = "10.0.0.0/8".parse().unwrap();
        let v6: Cidr = "fd00::/64".parse().unwrap();
        for op in [
            MapOp::UpsertSourceRange(1, v4),
            MapOp::UpsertSourceRange(1, v4),
            MapOp::UpsertSourceRange(1, v6),
            MapOp::UpsertSourceRange(2, v6),
        ] {
            s.apply(&op);
        }
        assert_eq!(
            (
                s.source_range_entries_of(Family::V4),
                s.source_range_entries_of(Family::V6),
                s.source_range_entries()
            ),
            (1, 2, 3)
        );
        s.apply(&MapOp::DeleteSourceRange(2, v6));
        assert_eq!(s.source_range_entries_of(Family::V6), 1);
    }
}
